"""How a TFX 1.16 component can output artifacts the Vertex AI / KFP UI renders (findings in
docs/running-on-vertex.md, "What the Vertex AI console shows").

TFX's first-party types compile to titles ``tfx.*`` (compiler_utils.TITLE_TO_CLASS_PATH), which
the console does not render; KFP renders ``system.Metrics`` / ``system.HTML`` /
``system.Markdown``. A custom artifact class whose TYPE_NAME *is* ``system.Metrics`` compiles to
exactly that title, and the V2 entrypoint then imports it as ``system.Metrics``: it works when a
top-level ``system`` module re-exports the classes. This test builds such a component in a
scratch directory and runs it both under LocalDagRunner and under the V2 entrypoint.
"""
import sys
import textwrap

import pytest

MODULE = '''
import os

from tfx.dsl.component.experimental.annotations import OutputArtifact
from tfx.dsl.component.experimental.decorators import component
from tfx.dsl.io import fileio
from tfx.types.artifact import Artifact


class VertexMetrics(Artifact):
    """Scalar metrics: numeric custom properties, shown by the console as a metrics table."""
    TYPE_NAME = "system.Metrics"


class VertexHTML(Artifact):
    """One HTML file *at* the artifact URI."""
    TYPE_NAME = "system.HTML"


class VertexMarkdown(Artifact):
    """One Markdown file *at* the artifact URI."""
    TYPE_NAME = "system.Markdown"


def write_file_artifact(artifact, text):
    """The file is the URI itself (KFP's convention). LocalDagRunner pre-creates each output URI
    as a directory; on Vertex AI the URI is a fresh gs:// object name."""
    if fileio.isdir(artifact.uri):
        fileio.rmtree(artifact.uri)
    fileio.makedirs(os.path.dirname(artifact.uri))
    with fileio.open(artifact.uri, "w") as handle:
        handle.write(text)


@component
def PrivacyCard(metrics: OutputArtifact[VertexMetrics], html: OutputArtifact[VertexHTML],
                markdown: OutputArtifact[VertexMarkdown]):
    metrics.set_float_custom_property("epsilon", 2.382)
    metrics.set_float_custom_property("delta", 1e-5)
    write_file_artifact(html, "<h1>epsilon = 2.382</h1>")
    write_file_artifact(markdown, "# epsilon = 2.382")
'''


@pytest.fixture
def demo_module(tmp_path, monkeypatch):
    (tmp_path / "vertex_ui_demo.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "system").mkdir()
    (tmp_path / "system" / "__init__.py").write_text(textwrap.dedent('''
        from vertex_ui_demo import VertexHTML as HTML, VertexMarkdown as Markdown, VertexMetrics as Metrics
    '''), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("vertex_ui_demo")
    for name in ("vertex_ui_demo", "system"):
        sys.modules.pop(name, None)


def _pipeline(module, root, metadata=None):
    from tfx import v1 as tfx

    return tfx.dsl.Pipeline(
        pipeline_name="vertex-ui-demo", pipeline_root=str(root), components=[module.PrivacyCard()],
        metadata_connection_config=(tfx.orchestration.metadata.sqlite_metadata_connection_config(str(metadata))
                                    if metadata else None))


def test_system_types_compile_to_kfp_titles_and_run_under_the_v2_entrypoint(demo_module, tmp_path):
    from tfx import v1 as tfx

    from kubeflow.local_v2 import run_spec_locally
    from kubeflow.spec_check import artifact_titles, check_spec_importable, custom_artifact_titles

    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image="img:1"),
        output_dir=str(tmp_path), output_filename="ui.json")
    spec = runner.run(_pipeline(demo_module, "gs://my-bucket/root"), write_out=False)
    assert artifact_titles(spec) == {"system.Metrics", "system.HTML", "system.Markdown"}
    assert custom_artifact_titles(spec) == artifact_titles(spec)  # imported by title in the image
    check_spec_importable(spec)

    outputs = run_spec_locally(spec, str(tmp_path / "vertex"), in_process=True)["PrivacyCard"]
    assert outputs["metrics"]["metadata"]["epsilon"] == pytest.approx(2.382)  # the console's table
    with open(outputs["html"]["uri"], encoding="utf-8") as handle:  # the console's HTML view
        assert handle.read() == "<h1>epsilon = 2.382</h1>"
    with open(outputs["markdown"]["uri"], encoding="utf-8") as handle:
        assert handle.read() == "# epsilon = 2.382"


def test_system_types_also_run_under_the_local_dag_runner(demo_module, tmp_path):
    import sqlite3

    from tfx import v1 as tfx

    tfx.orchestration.LocalDagRunner().run(_pipeline(demo_module, tmp_path / "root", tmp_path / "m.sqlite"))
    db = sqlite3.connect(tmp_path / "m.sqlite")
    rows = db.execute("SELECT t.name, a.uri FROM Artifact a JOIN Type t ON a.type_id = t.id").fetchall()
    by_type = dict(rows)
    assert set(by_type) == {"system.Metrics", "system.HTML", "system.Markdown"}
    with open(by_type["system.HTML"], encoding="utf-8") as handle:
        assert handle.read() == "<h1>epsilon = 2.382</h1>"
