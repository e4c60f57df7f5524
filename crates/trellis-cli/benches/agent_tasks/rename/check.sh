# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
! grep -rn get_total --include=*.py . && test "$(python3 main.py)" = '12 4.0'
