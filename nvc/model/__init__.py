"""The device model: a GPU and its MIG devices, and the driver capabilities with the files each needs."""
