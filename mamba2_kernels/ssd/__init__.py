"""The SSD chunked scan: one file per stage, ``naive.py`` holds the references."""
