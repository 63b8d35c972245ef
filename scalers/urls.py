"""Routes of the admission side, mounted at the site root: the scale API, ``/metrics`` and the
"Why is this job waiting?" page."""

from django.urls import path

from . import api, metrics, waiting

urlpatterns = [
    path("api/v1/scale", api.scale, name="api_scale"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("scalers/why-waiting/", waiting.why_waiting, name="why_waiting"),
]
