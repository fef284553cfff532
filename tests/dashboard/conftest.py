"""Fixtures of the dashboard tests: a synthetic store with every report, the committed store of an
earlier tiny real run, and a Starlette TestClient."""
import os
import shutil
import warnings
from html.parser import HTMLParser

import markupsafe
import pytest

with warnings.catch_warnings():
    # Starlette 1.x asks for `httpx2` (not in the lock); httpx works the same here.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: F401  (re-exported to the tests)

from tests.dashboard import fakestore

HERE = os.path.dirname(os.path.abspath(__file__))
# A real tiny run (the browser test's settings) of the DAG of 2026-11-22: CorpusIngest → DPVocabularyGen →
# MLMPretrainer → PrivacyAccountant. The browser test falls back to it when `dpbert run` fails.
TINY_RUN_STORE = os.path.join(HERE, "data", "tiny_run.sqlite")


@pytest.fixture(scope="session")
def fake_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("fake_store")
    root = base / "pipeline_root"
    return fakestore.build_store(str(base / "metadata.sqlite"), str(root))


@pytest.fixture()
def tiny_store(tmp_path):
    path = tmp_path / "metadata.sqlite"
    shutil.copy(TINY_RUN_STORE, path)
    return str(path)


@pytest.fixture()
def client(fake_store):
    from dashboard import create_app

    return TestClient(create_app(fake_store))


class LinkParser(HTMLParser):
    """Every href/src of a page, and every id (for fragment links)."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append(value)
            if name == "id":
                self.ids.add(value)


def links_of(html: str) -> LinkParser:
    parser = LinkParser()
    parser.feed(html)
    return parser


def esc(text: str) -> str:
    """``text`` as Jinja2's autoescape writes it."""
    return str(markupsafe.escape(text))
