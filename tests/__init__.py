"""The test suite, one folder per part of `openclaw_jax` (tests/trainer/ for openclaw_jax/trainer/, ...).

A package, so that tests import shared code by its full name (`tests.helpers.scripted_pool`,
`tests.gateway.test_gateway`) and two folders may hold test files of the same name."""
