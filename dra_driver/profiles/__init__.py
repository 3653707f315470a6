"""The device profiles (``dra_driver.devices.profile.DeviceProfile``), one folder per vendor, and
the registry that builds one by name (``registry.py``)."""
