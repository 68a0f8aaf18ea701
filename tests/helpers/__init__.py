"""What several test modules share: the loopback Hub-API server and its fixtures, a local Ray cluster, stored runs
and rows built without a model, the stored-data fuzzer, and the scripts tests run in processes of their own.

Test modules import these as `helpers.<module>`; tests/conftest.py registers the package for pytest's assertion
rewriting before anything imports it, and loads `helpers.hub_server` as a plugin (its fixtures).
"""
