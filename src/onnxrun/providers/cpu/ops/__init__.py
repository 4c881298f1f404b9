"""CPU kernels grouped by operator family; every module here is imported when the provider loads."""
