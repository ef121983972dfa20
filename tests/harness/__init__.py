"""The test suite's harness: rootfs builder, OCI bundles, runc, podman and containerd drivers, and all
that test files share (fixtures, constants, helpers): no test file imports another
(tests/test_suite_layout.py)."""
