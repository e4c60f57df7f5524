import argparse

parser = argparse.ArgumentParser(description="Greet someone.")
parser.add_argument("--name", default="world")
args = parser.parse_args()

print(f"Hello, {args.name}!")
