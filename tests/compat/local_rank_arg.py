"""A torch.distributed.launch-era script: takes --local_rank (or --local-rank) as an argument."""
import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
parser.add_argument("out")
args, rest = parser.parse_known_args()
with open(os.path.join(args.out, os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"arg": args.local_rank, "env": os.environ.get("LOCAL_RANK"), "argv": sys.argv[1:]}, f)
