"""One grader module per exercise id, in one folder per part of the book."""
