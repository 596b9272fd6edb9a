"""How training processes start: in this process (the worker), or spawned from a picklable spec."""
