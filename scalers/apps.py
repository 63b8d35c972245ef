from django.apps import AppConfig


class ScalersConfig(AppConfig):
    name = "scalers"
    default_auto_field = "django.db.models.BigAutoField"
