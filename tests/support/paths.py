"""Where the tests find the checkout they test."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/support/ is two below
