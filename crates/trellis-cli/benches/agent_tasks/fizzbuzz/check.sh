# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
python3 fizzbuzz.py > out.txt && printf '1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz\n' | diff - out.txt
