"""``/operations/`` pages (mounted in kici_site/urls.py)."""

from django.urls import path

from . import views

app_name = "operations"

urlpatterns = [
    path("", views.operation_list, name="list"),
    path("plan/", views.operation_plan, name="plan"),
    path("<int:pk>/", views.operation_detail, name="detail"),
    path("<int:pk>/approve/", views.operation_approve, name="approve"),
    path("<int:pk>/reject/", views.operation_reject, name="reject"),
]
