from django.apps import AppConfig


class FrontConfig(AppConfig):
    """The operator pages: views, page URLs and the template tags of the console."""

    name = "front"
    default_auto_field = "django.db.models.BigAutoField"
