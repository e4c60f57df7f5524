# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
test "$(tr -d ' \n' < count.txt)" = 42
