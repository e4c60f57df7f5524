# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
python3 -c "from words import reverse_words; assert reverse_words('a b c') == 'c b a'; assert reverse_words('one') == 'one'" && grep -q reverse_words test_words.py && python3 -m unittest -q test_words
