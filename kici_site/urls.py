"""URL map: the operator pages (``front.urls``) and the APIs under ``/api/v1/`` (``scalers.urls``,
``scalers.urls``)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from . import errors, health

handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.page_not_found

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages without a <link rel=icon> (/metrics, /healthz, JSON).
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
    path("admin/rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("front.urls")),
    path("", include("scalers.urls")),
]
