"""Scaler page routes, mounted at ``/scalers/``.

A scaler name never matches ``why-waiting`` here, so helper "adm"'s ``/scalers/why-waiting/`` page
works whichever order the two route lists are mounted in.
"""

from django.urls import path, register_converter

from . import pages


class ScalerNameConverter:
    regex = r"(?!why-waiting(?:/|$))[^/]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ScalerNameConverter, "scaler")

urlpatterns = [
    path("", pages.scaler_list, name="scaler_list"),
    path("<scaler:name>/", pages.scaler_detail, name="scaler_detail"),
    path("<scaler:name>/label-sets/<int:index>/host-access/", pages.host_access_editor, name="host_access_editor"),
    path(
        "<scaler:name>/label-sets/<int:index>/host-access/preview",
        pages.host_access_preview,
        name="host_access_preview",
    ),
    path("<scaler:name>/label-sets/<int:index>/host-access/apply", pages.host_access_apply, name="host_access_apply"),
]
