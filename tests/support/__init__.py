"""Helpers shared by test files in several folders of tests/ (imported as ``support.…``)."""
