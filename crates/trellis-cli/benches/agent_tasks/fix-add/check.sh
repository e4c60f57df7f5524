# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
cmp test_calc.py "$FIXTURE/test_calc.py" && python3 -m unittest -q test_calc
