"""A stand-in for the training scripts the docs' command lines name (train.py, old_script.py,
-m mypkg.train): says which rank it is and what it was given, and exits 0."""
import os
import sys

print(f"stand-in rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: {sys.argv[1:]}", flush=True)
