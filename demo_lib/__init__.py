"""Pieces of demo.py: stage machinery (`stages`), stage reports (`reports`), the summary."""
