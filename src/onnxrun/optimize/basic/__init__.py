"""Basic-level passes (ORT_ENABLE_BASIC): constant folding and redundant-node eliminations."""
