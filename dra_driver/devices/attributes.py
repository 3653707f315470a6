"""ResourceSlice attribute values as the API takes them; shared by the slice builder and the
profiles that describe their vendor's attributes."""

from __future__ import annotations

import re

from dra_driver.devices.model import DeviceAttribute

MAX_STRING_ATTRIBUTE = 64


def semver(text: str) -> str:
    """A "version" attribute value: semver, so "9.0" -> "9.0.0" and "535.104.05" -> "535.104.5"."""
    numbers = [int(part) for part in re.findall(r"\d+", text)[:3]]
    numbers += [0] * (3 - len(numbers))
    return ".".join(str(n) for n in numbers)


def string_attribute(value: str) -> DeviceAttribute:
    return {"string": value[:MAX_STRING_ATTRIBUTE]}


def version_attribute(text: str) -> DeviceAttribute:
    return {"version": semver(text)}
