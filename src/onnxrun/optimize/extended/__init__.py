"""Extended-level passes (ORT_ENABLE_EXTENDED): operator fusions."""
