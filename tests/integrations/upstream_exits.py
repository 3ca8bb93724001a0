"""An upstream MCP server that fails at start, as `mcp-server-git --repository` does on a
directory that is no repository: it says why on stderr and exits with 3 before it speaks MCP.
Run as `python upstream_exits.py`."""

import sys

print("upstream_exits: /nowhere is not a git repository", file=sys.stderr)
sys.exit(3)
