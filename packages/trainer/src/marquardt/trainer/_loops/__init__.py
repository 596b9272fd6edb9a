"""The training loops: the ``Loop`` protocol, the gradient (DDP) and LM loops, and their runner."""
