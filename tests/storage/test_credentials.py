"""A gs:// URI without usable Google Cloud credentials raises ``storage.CredentialsMissing``: one
line naming the URI, the client's error and the fix, from every method of the gs:// backends —
whether the client fails when it is created (google.auth finds no credentials) or on a request
(its token cannot be refreshed). Other errors, and other schemes, pass through unchanged. The
positive control is a backend method without the translation: the client's error escapes."""
import pytest
from google.auth import exceptions as auth_exceptions

from dpbert import storage
from dpbert.storage import base
from dpbert.storage.gcs import GCSStorage
from dpbert.storage.gfile import GFileStorage
from tests.storage.fake_gcs import FakeClient

URI = "gs://no-credentials-bucket/ledgers/dataset.json"
#: (method, extra arguments) of every Storage method, each called on URI.
CALLS = [("read", ()), ("read_bytes", ()), ("generation", ()), ("write_bytes", (b"{}",)), ("delete", ()),
         ("exists", ()), ("isdir", ()), ("makedirs", ()), ("listdir", ()), ("glob", ()),
         ("copytree", ("gs://no-credentials-bucket/copy",)), ("rmtree", ())]


class _NoCredentialsGCS(GCSStorage):
    """The client cannot be created: what ``google.cloud.storage.Client()`` raises without ADC."""

    @property
    def client(self):
        raise auth_exceptions.DefaultCredentialsError("Your default credentials were not found.")


class _RefusingClient(FakeClient):
    """Created, but every request fails refreshing its token (expired or revoked credentials)."""

    def bucket(self, name):
        raise auth_exceptions.RefreshError("Reauthentication is needed.")

    def list_blobs(self, *args, **kwargs):
        raise auth_exceptions.RefreshError("Reauthentication is needed.")


def _one_line_naming_the_uri(err: storage.CredentialsMissing, cause: str) -> None:
    text = str(err)
    assert "\n" not in text and text.startswith(URI + ": no usable Google Cloud credentials")
    assert f"google.auth {cause}" in text and "gcloud auth application-default login" in text
    assert "GOOGLE_APPLICATION_CREDENTIALS" in text and err.uri == URI


@pytest.mark.parametrize("method, extra", CALLS)
def test_no_credentials_when_the_client_is_created(method, extra):
    with pytest.raises(storage.CredentialsMissing) as err:
        getattr(_NoCredentialsGCS(), method)(URI, *extra)
    _one_line_naming_the_uri(err.value, "DefaultCredentialsError: Your default credentials were not found.")
    assert isinstance(err.value.cause, auth_exceptions.DefaultCredentialsError)


@pytest.mark.parametrize("method, extra", CALLS)
def test_credentials_refused_on_a_request(method, extra):
    with pytest.raises(storage.CredentialsMissing) as err:
        getattr(GCSStorage(client=_RefusingClient()), method)(URI, *extra)
    _one_line_naming_the_uri(err.value, "RefreshError")


def test_storage_for_and_the_json_helpers_raise_it(monkeypatch):
    from dpbert.storage import api

    monkeypatch.setitem(api._SINGLETONS, "gs", _NoCredentialsGCS())
    with pytest.raises(storage.CredentialsMissing):
        storage.read_json(URI, default={})          # not "missing": a default does not hide it
    with pytest.raises(storage.CredentialsMissing):
        storage.update_json(URI, lambda doc: doc)
    assert not isinstance(storage.CredentialsMissing(URI), OSError)  # no `except OSError` swallows it


def test_other_errors_pass_through_unchanged():
    class Broken(GCSStorage):
        @property
        def client(self):
            raise ConnectionError("network down")

    with pytest.raises(ConnectionError):
        Broken().read(URI)


def test_positive_control_without_the_translation_the_client_error_escapes(monkeypatch):
    monkeypatch.setattr(base, "is_credentials_error", lambda err: False)
    with pytest.raises(auth_exceptions.DefaultCredentialsError):
        _NoCredentialsGCS().read(URI)


def test_tensorflow_gfile_unauthenticated_on_gs_only(monkeypatch):
    """tf.io.gfile on gs:// (GFileStorage given a gs:// URI): TensorFlow's UnauthenticatedError
    is the same CredentialsMissing; on another scheme it is left as it is."""
    import tensorflow as tf

    from dpbert.storage import gfile

    class Refusing:
        def exists(self, uri):
            raise tf.errors.UnauthenticatedError(None, None, "Could not authenticate")

    monkeypatch.setattr(gfile, "_gfile", lambda: Refusing())
    with pytest.raises(storage.CredentialsMissing) as err:
        GFileStorage().exists(URI)
    assert "tensorflow" in str(err.value) and "UnauthenticatedError" in str(err.value)
    with pytest.raises(tf.errors.UnauthenticatedError):
        GFileStorage().exists("s3://bucket/x")
