"""Routes of the admission side, mounted at the site root: the scale API and ``/metrics``."""

from django.urls import path

from . import api, metrics

urlpatterns = [
    path("api/v1/scale", api.scale, name="api_scale"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
