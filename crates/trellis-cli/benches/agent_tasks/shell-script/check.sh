# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
test -f backup.sh && cmp notes/a.txt backup/a.txt && cmp notes/b.txt backup/b.txt && test ! -e backup/skip.md
