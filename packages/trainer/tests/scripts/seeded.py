"""Run train_seed.py (the seed script, imports changed) with torch's RNG seeded to 0.

The seed script itself draws its initial weights at random; seeding first lets a test
rebuild the same initial model and check that training lowered the loss.
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    import torch

    torch.manual_seed(0)
    script = str(Path(__file__).with_name("train_seed.py"))
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")
