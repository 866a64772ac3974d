"""Presentation: Perfetto traces, plots, the HTML report, terminal tables and plan explanations.

Every module here reads only Workloads, Plans, Timelines and plain result dicts.
matplotlib and rich are optional; they are imported lazily by the functions that
need them, so importing this package costs nothing.
"""
