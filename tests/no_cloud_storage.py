"""A storage spy in the place of dpbert.storage's gs:// backend, for tests that must prove nothing
reaches Cloud Storage: every call is recorded and fails."""


class NoCloudStorage:
    def __init__(self):
        self.touched = []

    def __getattr__(self, name):
        def refuse(uri=None, *args, **kwargs):
            self.touched.append(str(uri))
            raise AssertionError(f"gs:// contacted: {name} {uri}")
        return refuse
