"""URL map: the operator pages (``front.urls``) and the APIs under ``/api/v1/`` (``scalers.urls``,
``scalers.urls``)."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from django.views.generic import RedirectView
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

from lib import errors

from . import health

handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.page_not_found

# django-rq's dashboard (staff only) carries inline scripts and style attributes: it alone gets
# 'unsafe-inline' for them, on top of the console's policy (settings.SECURE_CSP).
_RQ_CSP = {
    **settings.SECURE_CSP,
    "script-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
}
_rq_patterns = get_api_urlpatterns() + get_admin_urlpatterns(view_wrapper=csp_override(_RQ_CSP))

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages without a <link rel=icon> (/metrics, /healthz, JSON).
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
    path("admin/rq/", include((_rq_patterns, "django_rq"))),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The machine-facing routes before the pages: the two sets match no path in common, and a path
    # is resolved by trying the patterns in order, so an API call (the many) fails through none of
    # the pages' patterns on its way.
    path("", include("scalers.urls")),
    path("", include("front.urls")),
]
