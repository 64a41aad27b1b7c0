"""Harnesses the tests share: nothing here is a test, no test module imports another."""
