"""What tests switch on in a running app: fault injection (``faults.py``). Nothing here runs unless
an app was built with ``security.allow_fault_injection``."""
