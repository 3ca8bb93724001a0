"""The process backend: bubblewrap sandboxes on the host, limited by rlimits and cgroups."""
