"""An upstream MCP server for the tests of `ptc mcp --upstream`, run as
`python upstream_content.py LABEL` (stdio).

Two instances with different labels offer the same tool names, as two filesystem servers on
different directories do. Its tools: `read_file` (text naming the label and the path),
`snapshot` (one answer of every content kind: text, image, audio, text and blob embedded
resources, a resource link) and `picture` (an image of any size, for the size bounds).
"""

from __future__ import annotations

import base64
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

LABEL = sys.argv[1] if len(sys.argv) > 1 else "files"
server: MCPServer[Any] = MCPServer(f"upstream-{LABEL}", log_level="WARNING")
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@server.tool(structured_output=False)
def read_file(path: str) -> str:
    """Reads a file of this server's directory."""
    return f"{LABEL}:{path}"


@server.tool(structured_output=False)
def snapshot() -> list[ContentBlock]:
    """One answer with every kind of content."""
    return [
        TextContent(type="text", text=f"snapshot of {LABEL}"),
        ImageContent(type="image", data=_b64(PNG), mime_type="image/png"),
        AudioContent(type="audio", data=_b64(b"RIFF\x00\x01"), mime_type="audio/wav"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri=f"file:///{LABEL}/notes.md", mime_type="text/markdown", text="# notes\nä ✓\n"
            ),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri=f"file:///{LABEL}/data.bin", mime_type=None, blob=_b64(bytes([0, 255, 1]))
            ),
        ),
        ResourceLink(
            type="resource_link",
            uri=f"file:///{LABEL}/big.csv",
            name="big.csv",
            mime_type="text/csv",
        ),
    ]


@server.tool(structured_output=False)
def picture(size: int) -> list[ContentBlock]:
    """An image of ``size`` bytes."""
    return [ImageContent(type="image", data=_b64(bytes(size)), mime_type="image/gif")]


if __name__ == "__main__":
    server.run("stdio")
