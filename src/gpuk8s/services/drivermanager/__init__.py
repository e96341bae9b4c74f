"""driver-manager: the kernel driver, the MXMACA SDK and VF counts on each GPU node."""
