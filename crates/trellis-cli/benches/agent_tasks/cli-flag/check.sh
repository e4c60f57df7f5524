# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
test "$(python3 greet.py --name Ann)" = 'Hello, Ann!' && test "$(python3 greet.py --name Ann --shout)" = 'HELLO, ANN!'
