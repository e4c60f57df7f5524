# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
test "$(python3 report.py)" = 'total: 200'
