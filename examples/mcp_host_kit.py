"""What the example MCP hosts (mcp_remote_host.py over Streamable HTTP, mcp_stdio_host.py
over arp-bridge's stdio) share: reading SDK objects on SDK 1.x and 2.x alike, checking a
picture, answering the robot's confirmations, and counting checks."""

import base64
import io
import re

from mcp import types


def g(obj, name):
    """Attribute `name` (camelCase, as MCP spells it) of an SDK object: SDK 2.x names it in
    snake_case, 1.x as MCP does."""
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, name)


def decodes(image, size=None):
    """The image content is a JPEG that decodes (with Pillow where installed), of `size`
    (width, height) if given."""
    raw = base64.b64decode(image.data)
    if g(image, "mimeType") != "image/jpeg" or raw[:2] != b"\xff\xd8":
        return False
    try:
        from PIL import Image
    except ImportError:
        print("  (Pillow not installed: the JPEG's markers checked, not decoded)")
        return raw[-2:] == b"\xff\xd9"
    with Image.open(io.BytesIO(raw)) as picture:
        picture.load()
        fits = picture.size == size if size else picture.size[0] > 0
        return picture.format == "JPEG" and fits


def declines_then_confirms(asked):
    """An elicitation callback for the robot's confirmations: the first declined, the
    others confirmed; each question's message appended to `asked`."""

    async def elicit(context, params):
        asked.append(params.message)
        if len(asked) == 1:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"confirm": True})

    return elicit


def image_of(result):
    """A tool result's image content, if any."""
    return next((c for c in result.content if c.type == "image"), None)


def error_code(result):
    """The ARP error code of a tool result that failed (`structuredContent.error.code`)."""
    return (g(result, "structuredContent") or {}).get("error", {}).get("code")


class Checks:
    """Named checks, printed as they pass or fail, and their summary."""

    def __init__(self, title):
        self.title = title
        self.results = []

    def expect(self, name, ok, detail=""):
        self.results.append(bool(ok))
        print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)}")

    def summary(self):
        """Prints the counts; the exit status (1 if any failed)."""
        failed = self.results.count(False)
        print(f"{self.title}: {len(self.results) - failed} passed, {failed} failed")
        return 1 if failed else 0
