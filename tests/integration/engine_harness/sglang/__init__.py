"""CALL-ORDER HARNESS, NOT SGLang (tests/integration/engine_harness/README.md)."""
