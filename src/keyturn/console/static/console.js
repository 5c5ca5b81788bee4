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
    var parts = fields(at);
    if (parts.hour + parts.minute + parts.second === "000000" && at.getMilliseconds() === 0) {
      // A midnight ends the day before: a custom date reads as the day the user picked.
      parts = fields(new Date(at.getTime() - 1));
      return parts.year + "-" + parts.month + "-" + parts.day + ", end of day";
    }
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
      parts.minute;
  }

  function fields(at) {
    var parts = {};
    new Intl.DateTimeFormat("en-US", {
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      second: "2-digit", hourCycle: "h23"
    }).formatToParts(at).forEach(function (p) { parts[p.type] = p.value; });
    return parts;
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
  // The rotate form names the zone, so the new key's page shows its times there too.
  document.querySelectorAll("input[type=hidden][name=tz]").forEach(function (el) {
    if (zone && !el.value) { el.value = zone; }
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
  var inFlight = null;
  var later = 0;
  var maxName = parseInt(name.dataset.max, 10);

  // The browser's zone comes first in the list; the server knows aliases it does not list.
  if (!tz.value && zone) {
    var mine = null;
    for (var i = 0; i < tz.options.length; i++) {
      if (tz.options[i].value === zone) { mine = tz.options[i]; break; }
    }
    if (!mine) { mine = new Option(zone, zone); }
    tz.insertBefore(mine, tz.options[1] || null);
    tz.value = zone;
  }

  function lifetime() {
    var checked = form.querySelector("input[name=lifetime]:checked");
    return checked ? checked.value : "";
  }

  function reason() {
    // Characters as the server counts them: code points, not UTF-16 units.
    var length = Array.from(name.value.trim()).length;
    if (!length) { return "Name the key to create it."; }
    if (length > maxName) {
      return "The name has " + length + " characters; at most " + maxName + " are allowed.";
    }
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

  // The expiry shown is never a stale answer: a change marks it pending at once, and only
  // the latest question is in flight (a slow server gets one request, not one per key).
  function ask() {
    var mine = ++asked;
    if (inFlight) { inFlight.abort(); }
    inFlight = new AbortController();
    expires.textContent = "…";
    expires.setAttribute("aria-busy", "true");
    var query = new URLSearchParams({ lifetime: lifetime(), date: date.value, tz: tz.value });
    fetch(form.dataset.preview + "?" + query.toString(), {
      credentials: "same-origin", headers: { Accept: "application/json" },
      signal: inFlight.signal
    }).then(function (response) {
      return response.ok ? response.json() : null;
    }).then(function (shown) {
      if (mine !== asked) { return; }
      expires.removeAttribute("aria-busy");
      if (!shown) { expires.textContent = "—"; return; }
      known = shown;
      if (shown.min) { date.min = shown.min; date.max = shown.max; }
      expires.textContent = shown.expires || "—";
      refresh();
    }).catch(function () {
      if (mine === asked) { expires.removeAttribute("aria-busy"); expires.textContent = "—"; }
    });
  }

  function askSoon() {  // typing a date: ask once the keys stop
    expires.textContent = "…";
    clearTimeout(later);
    later = setTimeout(ask, 150);
  }

  name.addEventListener("input", refresh);
  form.addEventListener("change", function () { clearTimeout(later); refresh(); ask(); });
  date.addEventListener("input", function () { refresh(); askSoon(); });
  refresh();
  ask();
})();
