"""Code the tests share that is not a fixture: scripted servers, reference implementations, process helpers."""
