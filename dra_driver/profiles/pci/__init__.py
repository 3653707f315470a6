"""A generic PCI accelerator: devices from sysfs, device nodes and one environment variable."""
