"""The dashboard's ASGI app (Starlette) and its server (uvicorn).

Pages (Jinja2, autoescape on):  ``/`` the runs; ``/runs/{run_id}`` one run (DAG, artifacts,
privacy ledger, plots). Charts: ``/runs/{run_id}/plots/{name}.svg`` (matplotlib, server-side).
JSON: ``/api/runs`` (the runs), ``/api/runs/{run_id}`` (exactly ``dpbert.report.build_report``
as strict JSON, ``dpbert.schema.encode``: infinities as the string ``"inf"``; the operator's
report), ``/api/runs/{run_id}/released`` (``dpbert.release.released_view`` of it: what leaves
the trust boundary), ``/api/runs/{run_id}/dag`` (the DAG and the artifacts as the page shows them).
Dataset: ``/dataset?ledger=<URI of a dataset ledger .json>`` (default: ``dpbert dashboard
--ledger``) every entry of one dataset's privacy ledger and the composed total after each against
its pinned budget, its chart ``/dataset/plot.svg?ledger=…`` and its JSON ``/api/dataset?ledger=…``
(``dashboard.dataset``); a run page links to its dataset's page when the run names one.

The run page marks every section computed on private data without noise "operator-only" and the
released DP values "released (DP)" (``dashboard.views.run_page``).

Read-only by construction: the ML Metadata store is opened READONLY for each request (or a
pipeline root's ``executor_output.json`` files are read, ``dpbert.pipeline_root``), only GET
(and HEAD) is routed, and no artifact file is ever opened. The one other file read is a dataset's
privacy ledger, which is not an artifact and holds only accounting numbers (``dashboard.dataset``
says why it may be read and how the read is confined). Every response carries a
Content-Security-Policy that allows no script at all.
"""
from __future__ import annotations

import ipaddress
import logging
import threading
from collections import OrderedDict
from typing import Optional, Sequence
from urllib.parse import quote

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from dashboard import views
from dpbert import metadata, schema
from dpbert.release import released_view
from dpbert.report import build_report
from dpbert.report_model import read_report

log = logging.getLogger("dpbert.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
PLOTS = ("dag", "budget", "loss", "loss_comparison", "exposure", "roc")
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; img-src 'self'; style-src 'self'; "
                                 b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP response (pages, SVG, JSON, static)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


_PLOT_CACHE: "OrderedDict[str, bytes]" = OrderedDict()
_PLOT_CACHE_SIZE = 64
_PLOT_CACHE_LOCK = threading.Lock()


def render_plot(name: str, args: tuple) -> bytes:
    """The SVG of a chart, memoised on its exact input data (rendering is the slow part)."""
    from dashboard import plots  # matplotlib: imported on the first chart

    key = name + schema.dumps(list(args), sort_keys=True)
    with _PLOT_CACHE_LOCK:
        if key in _PLOT_CACHE:
            _PLOT_CACHE.move_to_end(key)
            return _PLOT_CACHE[key]
    svg = getattr(plots, f"{name}_svg")(*args)
    with _PLOT_CACHE_LOCK:
        _PLOT_CACHE[key] = svg
        while len(_PLOT_CACHE) > _PLOT_CACHE_SIZE:
            _PLOT_CACHE.popitem(last=False)
    return svg


def run_reader(metadata_path: Optional[str], pipeline_root: Optional[str] = None) -> metadata.RunReader:
    """The runs the dashboard shows: the store's (``MetadataRunReader``) or, with ``pipeline_root``,
    its executor outputs' (``dpbert.pipeline_root.PipelineRootRunReader``)."""
    if pipeline_root is None:
        return metadata.MetadataRunReader(metadata_path)
    from dpbert.pipeline_root import PipelineRootRunReader

    return PipelineRootRunReader(pipeline_root)


def create_app(metadata_path: Optional[str], *, allowed_hosts: Optional[Sequence[str]] = None,
               pipeline_root: Optional[str] = None, ledger: Optional[str] = None) -> Starlette:
    """The dashboard over the ML Metadata store at ``metadata_path`` (opened READONLY per request),
    or, with ``pipeline_root`` (``metadata_path`` None), over the runs of a pipeline root's executor
    outputs (``dpbert.pipeline_root``: Vertex AI's ``gs://`` root, a rehearsal's folder; re-read per
    request).

    ``allowed_hosts``: accepted ``Host`` headers (DNS-rebinding guard); None accepts any, which
    ``serve`` narrows to the loopback names when bound to a loopback address. ``ledger``: the
    dataset ledger ``/dataset`` shows without a ``ledger`` parameter.
    """
    env = jinja2.Environment(loader=jinja2.PackageLoader("dashboard", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    templates = Jinja2Templates(env=env)

    if (metadata_path is None) == (pipeline_root is None):
        raise ValueError("create_app: give the ML Metadata store's path or a pipeline_root (one of them)")

    # One interface for both sources (dpbert.metadata.RunReader): re-read at each request.
    reader = run_reader(metadata_path, pipeline_root)
    list_runs, source = reader.list_runs, reader.source

    def find_run(run_id: str) -> metadata.RunInfo:
        for run in list_runs():
            if run.run_id == run_id:
                return run
        raise HTTPException(status_code=404, detail="no such run")

    def page(request: Request, name: str, context: dict, status_code: int = 200, headers=None) -> Response:
        return templates.TemplateResponse(request, name, dict(context, metadata_path=source),
                                          status_code=status_code, headers=headers)

    def index(request: Request) -> Response:
        runs = [views.run_summary(r) for r in list_runs()]
        return page(request, "index.html", {"runs": runs})

    def run_detail(request: Request) -> Response:
        run = find_run(request.path_params["run_id"])
        return page(request, "run.html", views.run_page(run, read_report(run)))

    def plot(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in PLOTS:
            raise HTTPException(status_code=404, detail="no such plot")
        run = find_run(request.path_params["run_id"])
        report = read_report(run)
        if not views.plots_available(run, report)[name]:
            raise HTTPException(status_code=404, detail="not in this run")
        if name == "dag":
            d = views.dag(run)
            args = (d["nodes"], d["edges"])
        elif name == "budget":
            bars = views.ledger_bars(run)
            args = (bars["bars"], bars["budget"])
        elif name == "loss":  # released: the DP model's curve only, against its true steps
            args = (views.released_loss_curve(report), None, views.released_loss_steps(report))
        elif name == "loss_comparison":  # operator-only: with the non-private baseline's
            args = (views.loss_curves(run, report),
                    views.number(report.pretraining.non_dp_final_mlm_loss),
                    views.loss_steps(run, report))
        elif name == "exposure":
            args = (views.exposure_groups(report),)
        else:
            args = (views.membership_attacks(report),)
        svg = render_plot(name, args)
        return Response(svg, media_type="image/svg+xml")

    def dataset_of(request: Request) -> dict:
        from dashboard import dataset

        uri = request.query_params.get("ledger") or ledger
        if not uri:
            raise HTTPException(status_code=404, detail="no dataset ledger given (?ledger=<URI of <dataset id>.json>)")
        try:
            return dataset.dataset_view(uri)
        except dataset.NoLedger as err:
            raise HTTPException(status_code=404, detail=str(err)) from None

    def dataset_detail(request: Request) -> Response:
        from dashboard import dataset

        view = dataset_of(request)
        return page(request, "dataset.html", dict(dataset.dataset_page(view), query=dataset_query(view["ledger"])))

    def dataset_plot(request: Request) -> Response:
        from dashboard import dataset

        view = dataset_of(request)
        points = dataset.chart_points(view)
        if not points:
            raise HTTPException(status_code=404, detail="no entry in this ledger")
        return Response(render_plot("dataset", (points, view.get("epsilon_budget"))), media_type="image/svg+xml")

    def api_dataset(request: Request) -> Response:
        return JSONResponse(schema.encode(dataset_of(request)))

    def api_runs(request: Request) -> Response:
        out = []
        for r in list_runs():
            summary = views.run_summary(r)
            privacy = summary["privacy"] or {}
            out.append({"run_id": r.run_id, "pipeline": r.pipeline, "status": r.status,
                        "duration_s": summary["duration_s"], "created_ms": r.created_ms,
                        "components": summary["components"],
                        # released ledger values: what the run spent
                        "epsilon_total_pld": privacy.get("epsilon_value"), "unit": privacy.get("unit"),
                        "delta": privacy.get("delta_value"), "epsilon_budget": privacy.get("budget_value"),
                        "within_budget": privacy.get("within"),
                        "report": path_for("api_run", run_id=r.run_id),
                        "page": path_for("run", run_id=r.run_id)})
        return JSONResponse(schema.encode(out))

    def api_run(request: Request) -> Response:
        return JSONResponse(schema.encode(build_report(find_run(request.path_params["run_id"]))))

    def api_released(request: Request) -> Response:
        return JSONResponse(schema.encode(released_view(build_report(find_run(request.path_params["run_id"])))))

    def api_dag(request: Request) -> Response:
        d = views.dag(find_run(request.path_params["run_id"]))
        return JSONResponse(schema.encode({"nodes": d["nodes"], "edges": d["edges"],
                                           "artifacts": d["artifacts"]}))

    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                                headers=getattr(exc, "headers", None))
        return page(request, "error.html", {"status": exc.status_code, "detail": exc.detail},
                    status_code=exc.status_code, headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("dashboard: %s failed", request.url.path)
        message = "internal error (see the server log)"
        # This handler runs outside the middleware stack: it adds the security headers itself.
        headers = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=500, headers=headers)
        return Response(message, status_code=500, media_type="text/plain", headers=headers)

    routes = [
        Route("/", index, methods=["GET"], name="index"),
        # The plot route precedes the page route: a run id may contain "/" ({run_id:path}).
        Route("/runs/{run_id:path}/plots/{name}.svg", plot, methods=["GET"], name="plot"),
        Route("/runs/{run_id:path}", run_detail, methods=["GET"], name="run"),
        Route("/dataset", dataset_detail, methods=["GET"], name="dataset"),
        Route("/dataset/plot.svg", dataset_plot, methods=["GET"], name="dataset_plot"),
        Route("/api/dataset", api_dataset, methods=["GET"], name="api_dataset"),
        Route("/api/runs", api_runs, methods=["GET"], name="api_runs"),
        Route("/api/runs/{run_id:path}/dag", api_dag, methods=["GET"], name="api_dag"),
        Route("/api/runs/{run_id:path}/released", api_released, methods=["GET"], name="api_released"),
        Route("/api/runs/{run_id:path}", api_run, methods=["GET"], name="api_run"),
        Mount("/static", app=StaticFiles(packages=[("dashboard", "static")]), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: http_error, Exception: server_error})

    def path_for(route: str, /, **params) -> str:
        """An app-relative URL with every parameter percent-encoded (run ids are free text)."""
        return str(app.url_path_for(route, **{k: quote(str(v), safe=":/") for k, v in params.items()}))

    def dataset_query(uri: Optional[str]) -> str:
        """``?ledger=<uri>`` percent-encoded (a path may hold any character)."""
        return "?ledger=" + quote(str(uri), safe="") if uri else ""

    env.globals.update(path_for=path_for, fmt=views.fmt, dataset_query=dataset_query)
    app.state.metadata_path = metadata_path
    app.state.pipeline_root = pipeline_root
    app.state.ledger = ledger
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(metadata_path: Optional[str], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
          pipeline_root: Optional[str] = None, ledger: Optional[str] = None) -> None:
    """Serve the dashboard with uvicorn until interrupted (binds 127.0.0.1 unless told otherwise);
    over a pipeline root's runs instead of a store with ``pipeline_root`` (``create_app``)."""
    import uvicorn

    if is_loopback(host):
        allowed = sorted(set(LOOPBACK_HOSTS) | {host})
    else:
        allowed = None
        log.warning("dashboard: listening on %s, reachable from other machines; it serves privacy "
                    "ledgers and run metadata without authentication", host)
    app = create_app(metadata_path, allowed_hosts=allowed, pipeline_root=pipeline_root, ledger=ledger)
    shown = f"[{host}]" if ":" in host else host
    source = f"store {metadata_path}" if pipeline_root is None else f"pipeline root {pipeline_root}"
    print(f"dpbert dashboard: http://{shown}:{port}/  ({source}, read-only; Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False,
                proxy_headers=False, access_log=True)
