// The console's progressive enhancement. Every rule stays on the server: without this file
// the forms still work, and the server refuses what this file would have disabled.
(function () {
  "use strict";
  var zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (e) {
    zone = "";
  }

  // Times: shown in the browser's own zone, which the page names once.
  function localText(iso) {
    var at = new Date(iso);
    if (isNaN(at.getTime())) { return null; }
    var parts = {};
    new Intl.DateTimeFormat("en-US", {
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      hourCycle: "h23"
    }).formatToParts(at).forEach(function (p) { parts[p.type] = p.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
      parts.minute;
  }
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    if (!zone) { return; }
    var text = localText(el.getAttribute("datetime"));
    if (text) { el.textContent = text; }
  });
  document.querySelectorAll(".tzname").forEach(function (el) {
    if (zone) { el.textContent = zone; }
  });
  document.querySelectorAll(".zone-note").forEach(function (el) {
    if (zone) { el.textContent = " (" + zone + ")"; }
  });

  // The copy button of a new key.
  var copy = document.getElementById("copy");
  var secret = document.getElementById("secret");
  if (copy && secret) {
    copy.hidden = false;
    copy.addEventListener("click", function () {
      var status = document.getElementById("copy-status");
      var done = function () { status.textContent = "Copied to the clipboard."; };
      var fail = function () {
        secret.select();
        status.textContent = "Select the key and copy it yourself (Ctrl+C).";
      };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(secret.value).then(done, fail);
      } else {
        fail();
      }
    });
  }

  // The create form: zone, live expiry, disabled states.
  var form = document.getElementById("create");
  if (!form) { return; }
  var name = document.getElementById("name");
  var date = document.getElementById("date");
  var tz = document.getElementById("tz");
  var expires = document.getElementById("expires");
  var button = document.getElementById("create-button");
  var why = document.getElementById("create-why");
  var known = { min: date.min || null, max: date.max || null, problem: null };
  var asked = 0;

  if (!tz.value && zone) {
    for (var i = 0; i < tz.options.length; i++) {
      if (tz.options[i].value === zone) { tz.value = zone; break; }
    }
  }

  function lifetime() {
    var checked = form.querySelector("input[name=lifetime]:checked");
    return checked ? checked.value : "";
  }

  function reason() {
    if (!name.value.trim()) { return "Name the key to create it."; }
    if (lifetime() === "custom") {
      if (!date.value) { return "Choose the custom expiry date."; }
      if (known.min && date.value < known.min) { return "The date must be tomorrow or later."; }
      if (known.max && date.value > known.max) { return "The date must be at most one year away."; }
      if (known.problem) { return known.problem; }
    }
    return "";
  }

  function refresh() {
    var custom = lifetime() === "custom";
    date.disabled = !custom;
    date.required = custom;
    var text = reason();
    button.disabled = text !== "";
    why.textContent = text;
  }

  function ask() {
    var mine = ++asked;
    var query = new URLSearchParams({ lifetime: lifetime(), date: date.value, tz: tz.value });
    fetch(form.dataset.preview + "?" + query.toString(), {
      credentials: "same-origin", headers: { Accept: "application/json" }
    }).then(function (response) {
      return response.ok ? response.json() : null;
    }).then(function (shown) {
      if (!shown || mine !== asked) { return; }
      known = shown;
      if (shown.min) { date.min = shown.min; date.max = shown.max; }
      expires.textContent = shown.expires || "—";
      refresh();
    }).catch(function () { /* the server still decides on submit */ });
  }

  name.addEventListener("input", refresh);
  form.addEventListener("change", function () { refresh(); ask(); });
  date.addEventListener("input", function () { refresh(); ask(); });
  refresh();
  ask();
})();
