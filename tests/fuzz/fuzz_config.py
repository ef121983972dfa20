"""Fuzz target: the configuration file, /etc/nvc-py/config.yaml, as nvc.config.load reads it (UTF-8
text, then nvc.config.parse: the YAML document, then every key's check). The parsed document's
cache in /run/nvc-py is pointed at a directory that cannot be made: no file is written."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    import yaml  # noqa: F401 - nvc.config.yamlfile imports it when first used: instrumented here

    from nvc import config
    from nvc.config import yamlfile as configyaml
    from nvc.errors import NvcError

configyaml.CACHE_PATH = "/proc/nvc-py-fuzz/config-cache.json"
PATH = "/etc/nvc-py/config.yaml"


def one(data: bytes) -> None:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return  # load() refuses it: "not UTF-8 text"
    config.show(config.parse(text, PATH))


if __name__ == "__main__":
    fuzz(one, (NvcError,))
