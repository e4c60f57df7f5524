# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
test -f SUMMARY.md && python3 - <<'PY'
text = open('SUMMARY.md').read()
assert len(text.split()) >= 10, text
assert 'Lumen' in text or 'lumen' in text, text
assert 'site' in text.lower() or 'html' in text.lower() or 'website' in text.lower(), text
PY
