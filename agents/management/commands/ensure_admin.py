"""Create the first superuser with a generated password and print its credentials once."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a superuser 'admin' with a random password when no superuser exists; print it once."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write(
                "a superuser exists (its password was printed when it was created); "
                "to set a new one: .venv/bin/python manage.py changepassword <username>"
            )
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS(f"created superuser  username: {username}  password: {password}"))
        self.stdout.write("this password is shown only now; change it under /admin/")
