"""The config file read and parsed, hardened: a regular file of at most
1 MiB, read without ever blocking, UTF-8, safe YAML without anchors or
aliases, nested at most 32 deep, no key twice in one mapping. What it holds
is checked by config.resolve.

Functions take ``error``, the exception class they report with; the
message names the file."""
import os
import stat

import yaml

from ._files import kind

FILE_MAX = 1 << 20


class _ConfigYAMLError(yaml.YAMLError):
    """A config-specific YAML problem, reported as it is (with the file)."""


class _ConfigLoader(yaml.SafeLoader):
    """Safe loading without anchors/aliases (a few hundred bytes of nested
    aliases, "billion laughs", would expand to gigabytes), with a bounded
    nesting depth (deep nesting would exhaust the recursion limit) and no
    key given twice in one mapping."""

    MAX_DEPTH = 32

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML alias *{ev.anchor} is not allowed in a config", ev.start_mark)
        self._depth += 1
        try:
            if self._depth > self.MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _ConfigYAMLError(f"nested deeper than {self.MAX_DEPTH} levels "
                                       f"(at line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _value in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                if key in first:
                    raise _ConfigYAMLError(f"key {key!r} appears twice (lines {first[key]} "
                                           f"and {line})")
                first[key] = line
            except TypeError:
                continue  # an unhashable key: the constructor reports it
        return super().construct_mapping(node, deep)


def _read(path, error):
    """The file's bytes, at most FILE_MAX. Never blocks: the open does not
    wait for a FIFO's writer, and anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise error(f"{path}: cannot read config: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: a config must be a regular file, this is "
                        f"{kind(st.st_mode)}")
        if st.st_size > FILE_MAX:
            raise error(f"{path}: config is larger than {FILE_MAX} bytes")
        chunks, n = [], 0
        while n <= FILE_MAX:
            b = os.read(fd, FILE_MAX + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
    except OSError as e:
        raise error(f"{path}: cannot read config: {e.strerror}") from None
    finally:
        os.close(fd)
    if n > FILE_MAX:  # grew while read
        raise error(f"{path}: config is larger than {FILE_MAX} bytes")
    return b"".join(chunks)


def load_yaml(path, error):
    """What the config file at path holds (None for an empty one),
    unchecked; error if it cannot be read or parsed."""
    data = _read(path, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: config is not UTF-8 text ({e.reason} at byte "
                    f"{e.start})") from None
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except _ConfigYAMLError as e:
        raise error(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise error(f"{path}: config is nested too deeply") from None
