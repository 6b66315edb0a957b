"""CALL-ORDER HARNESS, NOT vLLM (tests/integration/engine_harness/README.md)."""
