"""The driver's device contract: the device model, the share model and the ``DeviceProfile``
interface every vendor implements (``dra_driver.profiles``). Imports nothing of the driver."""
